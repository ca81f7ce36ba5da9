//! devmem-nic (sans-IO engine).
