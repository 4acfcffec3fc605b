"""The notebooks' surface: figures in one style (plots), the Bézier explorer (widgets), the first
call of every notebook (notebook), the papermill runner (run), and the measured numbers of README.md
and docs/, generated from the stored tables (pages)."""
