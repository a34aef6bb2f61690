"""The compressors' shared numerics: the tail estimators SIDCo and its peers fit, and the
threshold selection and exact Top-k they select with."""
