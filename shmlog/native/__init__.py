"""numba's configuration and the native pieces every kernel uses: atomics with
acquire/release ordering, CRC32C, typed containers. Imports only common.
"""
