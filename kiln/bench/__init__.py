"""The benchmark harness (`kiln bench`) and the built-in model zoo.

    from kiln.bench.zoo import ZOO, loss_of          # small real models, no downloads
    from kiln.bench.accuracy import same             # PyTorch's accuracy rule
    kiln bench --help                                # the harness

Only this package may call torch.compile and read torch._dynamo's counters: they are what kiln
is measured against.
"""
