"""The workloads the `ferry` verbs run, one module per verb, each returning data.

- bench: `ferry bench`, decode steps over a host KV cache under each copy policy (run_bench); its options
  (bench_config), rows (bench_rows), report (bench_report), and a draft row's prediction (several);
- validate: `ferry validate`, the hash gate over every copy policy (run_validate);
- table: `ferry table`, cells read and copied per number of sequences (build_table);
- plan: `ferry plan`, the copy plan of one window (window_plan);
- common: what they share (option checks, the split's backend, cache contents);
- devices: the devices a decode run spreads its layers over, and where each layer's KV lives;
- model_file: a model's KV geometry from its GGUF metadata (`--model`).

They sit above the library (tensors, backends, the scheduler, the KV cache) and below the
command line, which parses and prints.
"""
