"""DiffDT's geometric piece: conditional flow matching over brain-network connectivity matrices."""
