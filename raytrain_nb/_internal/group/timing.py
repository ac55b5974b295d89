"""How often and how long the driver waits for its workers (one place, read by every module that waits)."""

#: How often a running cell's output and metrics are polled.
POLL_INTERVAL_S = 0.1
#: After an interrupt: how long a rank may take to stop before it is named with its stack.
INTERRUPT_WAIT_S = 2.0
#: Deadline of one control call (release, poll, stack) to a rank that should answer at once.
CONTROL_CALL_S = 5.0
