"""Process-level services every layer may use: atomic writes, threads, progress, devices, processes."""
