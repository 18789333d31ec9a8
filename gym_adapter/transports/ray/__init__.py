"""The Ray transport: ``RayGym`` (``_gym``) over one ``GymActor`` per instance (``_actor``),
called through a trio-asyncio bridge (``_bridge``), with the cluster's placement and options
(``_cluster``), Ray's errors mapped to the contract's (``_errors``) and reply streams
(``_stream``). Ray is an optional extra: nothing imports this package until it is asked for."""
