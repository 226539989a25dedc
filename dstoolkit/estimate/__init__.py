"""dstoolkit.estimate"""
