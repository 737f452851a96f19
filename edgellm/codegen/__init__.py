"""Code generators (llvmlite IR) of the kernels' inner tiles, made into numba intrinsics:
the kernels in kernels/ and step/ call them."""
