"""Fused kernels: each module holds the kernel, its launcher, the autograd wrapper and a plain-torch reference."""
