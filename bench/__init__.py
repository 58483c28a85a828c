"""``torchmux bench`` and everything that measures torchmux against other systems.

- cli.py: the ``torchmux bench`` command (parent process: one child process per model and system).
- run.py: what a child process runs (compile, first call, interleaved timing rounds).
- results.py, report.py: statistics, the table, the JSON and the chart.
- zoo.py: the bench models; demo.py: ``torchmux demo``.
- scripts/: one-off measurements (dispatch overhead, ONNX Runtime / TVM quick checks, Triton bandwidth).
"""
