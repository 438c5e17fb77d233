"""bfloat16 for numpy, which has no such dtype: bf16 values travel as their uint16
bit patterns (the upper half of the float32 bits)."""


def to_bf16(x):
    """float32 (or anything numpy converts) -> uint16 bf16 bit patterns, rounded to
    nearest even (NaN stays NaN), as torch's .to(torch.bfloat16) rounds."""
    import numpy as np
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = np.isnan(f)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def from_bf16(b):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    import numpy as np
    b = np.asarray(b)
    if b.dtype != np.uint16:
        raise TypeError(f"bf16 bit patterns are uint16, got {b.dtype}")
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)
