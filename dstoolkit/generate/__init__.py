"""dstoolkit.generate"""
