"""dstoolkit.runtime.bench"""
