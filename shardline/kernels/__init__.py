"""GPU kernels, each beside the plain-torch reference that is also the CPU path.

Every public op here takes torch tensors and dispatches on device: CUDA tensors take the fused
Triton kernel when one exists (and `SHARDLINE_DISABLE_TRITON` is not set at engine start),
everything else runs the `*_ref` function next to it. Tests compare the two on odd shapes.
"""
