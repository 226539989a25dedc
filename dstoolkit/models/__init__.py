"""dstoolkit.models"""
