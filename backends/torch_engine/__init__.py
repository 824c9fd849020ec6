"""hearth's PyTorch engine: scheduler, block manager and request (pure Python), model runner, loaders, kernels."""
