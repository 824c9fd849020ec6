"""Plain nn.Module model definitions; transforms (quantization, ...) are applied to them afterwards."""
