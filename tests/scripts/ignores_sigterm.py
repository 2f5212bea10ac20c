"""A rank that never ends on SIGTERM (as one blocked in native code, whose Python handler never
runs): it ignores the signal and waits."""

import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.1)
