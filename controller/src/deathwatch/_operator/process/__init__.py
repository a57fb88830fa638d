"""The process: its arguments (`command`) and the configuration they make (`config`), every
part built once and started in order (`app`: wiring only), kopf's hooks into the process's
life (`lifecycle`), and the timed loops that drive the clock's passes (`timers`)."""
