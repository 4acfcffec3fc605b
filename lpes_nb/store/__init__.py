"""Where things live: the result store (results), the disjoint record split (splits), the
datasets (data), the embedded models and their cache (models), and a stored curve applied to a
model (stored_curve)."""
