"""The batch contract that ``data/`` (which builds batches) and ``module/`` (which consumes them) share.

Both packages import these names from here, so neither imports the other.

- ``IGNORE_INDEX``: the label value that receives no loss term (HF's and PyTorch's ``-100``).
- The window keys the accumulation-window loader attaches to every training micro-batch (HF
  ``Trainer.get_batch_samples`` counts a whole window before its first forward): ``num_items_in_batch`` (the
  window's target count, an ``int``), ``num_items_in_micro_batch`` (this micro-batch's own count) and
  ``num_batches_in_window`` (the window's number of micro-batches). The module needs the last two for HF's
  fallback (a per-batch mean divided by the window length) and to skip a micro-batch without targets; reading
  them from a device tensor would cost a host-device sync per micro-batch.
"""

IGNORE_INDEX = -100

NUM_ITEMS_KEY = "num_items_in_batch"
MICRO_ITEMS_KEY = "num_items_in_micro_batch"
WINDOW_LENGTH_KEY = "num_batches_in_window"
WINDOW_KEYS = (NUM_ITEMS_KEY, MICRO_ITEMS_KEY, WINDOW_LENGTH_KEY)
