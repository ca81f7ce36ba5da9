//! siw (sans-IO engine).
