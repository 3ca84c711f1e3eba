"""The broker's control protocol: versioned JSON requests and replies, and the
client's side of the control endpoint. Imports common.
"""
