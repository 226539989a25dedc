"""dstoolkit.train"""
