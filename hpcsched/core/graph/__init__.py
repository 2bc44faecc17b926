"""Task graphs and the pure algorithms over them: dask-style graphs normalized into tasks,
static priorities (order), linear-chain fusion, and initial worker assignment (Mars)."""
