"""A run's logs (events, the driver's log lines), read back and worded; the HTML report."""
