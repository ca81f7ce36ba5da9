//! roce-model (sans-IO engine).
