"""Running one model over several processes with torch.distributed (started by torchrun):
tensor parallel (tensor.py), pipeline parallel (pipeline.py), each rank reading only its part
of the file (slicing.py), joining and failing with a bounded wait (launch.py); place.py is the
entry point ``clearlm.load`` uses."""
