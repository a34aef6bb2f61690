"""The compressors' shared numerics: the tail estimators SIDCo and its peers fit, what SIDCo's stage
loop reads of a gradient on any backend (:mod:`compressors.numerics.tails`), and the threshold
selection and exact Top-k they select with."""
