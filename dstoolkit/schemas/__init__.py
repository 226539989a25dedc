"""dstoolkit.schemas"""
