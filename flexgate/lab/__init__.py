"""The labs, the mocks, the simulated sites and the plots: what `flexgate lab`, `flexgate
mock-vtn`, `--plot`, the tests and the benchmarks run, none of it the product itself.

- the event lab (`run`: the whole chain on loopback; `jobs`: its site's job mix), its meter
  (`meter`), characterisation (`characterise`), watch and report (`report`); the fast lab
  (`fast`), the lock lab (`lock`) and the compose lab (`compose`: the same chain as containers);
- the mock VTNs: OpenADR 2.0b (`mockvtn`, openleadr's VTN) and 3.1 (`mockvtn31`, its objects
  and notifications in `vtn31state`, its REST API by part in `vtn31api`);
- simulated sites on a stepped clock (`simsite`; `realsite`: the campaign's, with a realistic
  meter and a site that changes), a probe on simulated GPUs (`probesim`), a replayed site's
  other load (`loadshape`);
- the figures (`plots`, matplotlib: the `lab` extra).

Nothing is imported here: `flexgate.lab.X` loads only what X needs.
"""
