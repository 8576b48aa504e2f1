"""Fast attention kernels: GRAPE-AP path-integral attention (chunked PyTorch and Triton)."""
from attention_kernels.grape_ap import grape_ap_attention, grape_ap_chunked

__all__ = ["grape_ap_attention", "grape_ap_chunked"]
