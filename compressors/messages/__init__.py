"""What a compressor returns and what it weighs: the typed messages (:mod:`compressors.messages.kinds`,
:mod:`compressors.messages.sparse`) and their bytes and collective on the wire
(:mod:`compressors.messages.wire`, torch-free)."""
