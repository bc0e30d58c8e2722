nqn.2026-11.io.fx100:lab-host
