"""The model definitions the Hydra authors' code imports (``models.mobilenet``,
``models.resnet``) but its repository does not hold, plus the small CNN of
jsfl's Fashion-MNIST setting.  Our own code: each mirrors jsfl's staged model
stage for stage (``jsfl/models/``) so that a cut index means the same stage
on both sides, with PyTorch's default layer initialisation (nothing here
re-initialises a layer)."""
