"""Running the workbook somewhere: this CPU's throughput (throughput), standalone timings (bench), cost
plans (costs, on the papermill-free arithmetic of cost_model, which the GPU kit imports on a machine
without papermill), the GPU kit (gpu_kit), and carrying files to a machine without network (carry)."""
