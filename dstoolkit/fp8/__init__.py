"""dstoolkit.fp8"""
