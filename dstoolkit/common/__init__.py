"""dstoolkit.common: the bottom of the house. Small helpers every layer shares, each defined once
(atomic file writes, did-you-mean, the strict pydantic base model and the "auto" type). Imports nothing
else from dstoolkit."""
