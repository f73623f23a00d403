"""The torch.compile backend: FX matching (ATen graph -> epilogue IR), decisions
from the tuning database, the custom op. Built by the backend issue."""
