"""dstoolkit.bench"""
