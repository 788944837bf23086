"""Data: text sources, tokenisers, packing, and synthetic reasoning tasks."""
