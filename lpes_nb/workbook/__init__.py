"""The notebooks' surface: figures in one style (plots), the Bézier explorer (widgets), the first
call of every notebook (notebook), and the papermill runner (run)."""
