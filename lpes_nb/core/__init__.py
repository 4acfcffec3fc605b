"""The method itself — the RoPE patch (rope, interventions), Bézier curves (bezier), the
curve-constrained GA (ga) and the methods (methods: PI, Dynamic NTK, Ms-PoE, CALIOPE, LASP, …).

The module a researcher imports into their own code: it loads torch, numpy and transformers, and
nothing of the notebooks' machinery (pandas, matplotlib, widgets; tests/test_architecture.py holds it)."""
