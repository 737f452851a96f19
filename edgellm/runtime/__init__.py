"""The process and the machine: numba's environment and cache loading, native
libraries' guard, the CPU's SIMD path, and files edgellm writes."""
