"""Inputs: model descriptions, hardware profiles, the training job and the cluster."""
