"""The record batch, the unit of the ring, the log and the wire: its binary layout
and its codec (encode, validate, decode). Imports common and native.
"""
