"""What the TUI's ``App.run()`` returns: what the user chose for the job when leaving.

Textual-free, so ``advisor attach`` can act on it without importing the UI.
"""

from __future__ import annotations

RESULT_LEFT_RUNNING = "left-running"  # quit while training ran: leave it running, keep recording it
RESULT_STOP_TRAINING = "stop-training"  # quit while training ran: stop the training
RESULT_FINISHED = "finished"  # quit after training had ended (or a recorded session)
