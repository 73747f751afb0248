"""Method name -> module; importable without JAX (config, docs, reports)."""

METHODS = {
    "fedavg": "jsfl.methods.fedavg",
    "splitfedv1": "jsfl.methods.splitfedv1",
    "sfl": "jsfl.methods.sfl",
    # SplitFed baselines of the Hydra paper (SPEC 2)
    "splitfedv3": "jsfl.methods.splitfedv3",
    "splitnn": "jsfl.methods.splitnn",
    "multihead": "jsfl.methods.multihead",
    "mergesfl": "jsfl.methods.mergesfl",
    "hydra": "jsfl.methods.hydra",
    # sequential FL and its parallel baselines (SPEC 5)
    "fedseq": "jsfl.methods.fedseq",
    "sfedkd": "jsfl.methods.sfedkd",
    "cwc": "jsfl.methods.cwc",
    "fedprox": "jsfl.methods.fedprox",
    "fedcurv": "jsfl.methods.fedcurv",
    "fedntd": "jsfl.methods.fedntd",
    # MultiSFL (KoReA-SFL) and the SFL-form baselines of its paper (SPEC 4, 5)
    "multisfl": "jsfl.methods.multisfl",
    "sfl_fedntd": "jsfl.methods.sfl_fedntd",
    "sfl_fedexp": "jsfl.methods.sfl_fedexp",
    "sfl_fedmut": "jsfl.methods.sfl_fedmut",
    # the worked example of docs/extending.md
    "sfl_smooth": "jsfl.methods.sfl_smooth",
}
