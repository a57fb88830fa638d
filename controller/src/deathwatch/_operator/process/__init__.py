"""The process: its arguments (`command`), every part built once and started in order
(`app`: wiring only), and the timed loops that drive the clock's passes (`timers`)."""
