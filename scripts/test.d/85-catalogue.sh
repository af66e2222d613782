#!/usr/bin/env bash
# scripts/test: background lane 3
# The catalogue of broken jobs (issue 28, "Proof: a catalogue of broken
# jobs"): test/catalogue/run.sh runs test/catalogue/catalogue.txt through
# the sign-off runner (idempotency-matrix --job). The same refund job in
# each helper language (Python on pg_idempotency, Ruby on the
# pg-idempotency gem, Node.js on its npm package; the plain functions, the
# directory queue of test/signoff, no broker) and its one-change mutations:
# ignores the verdict, the effect before the claim, the completion before
# the effect, a copy it schedules of itself (without a claim, and under a
# key of its own), a key from the message id, arguments that differ per
# delivery. Each runs with only the policy and cases that catch it and must
# exit 1, exactly those cases failing, each with its diagnosis sentence;
# the correct variants (the base, a prefixed key, a hashed key declared
# with key_command; the wrapper in each language: a Celery task on kombu's
# filesystem transport, a Sidekiq job behind the middleware and an
# sqs-consumer handler behind idempotent, the last two called as their
# library calls them with messages of the directory queue, no Redis or
# SQS; and Node.js's batch wrapper idempotentBatch) must pass under hold
# (the base every case, the keys 1, 2, 5, 6 and 9, the wrappers 1-13, the
# batch wrapper 1-13 and 20), each report naming what made the claims
# (plain, or the wrapper, from the point hello). With the job file
# made for the run's own HTTP endpoint (effect = http): swallows provider
# errors, no client timeout, retries a permanent refusal forever, each
# failing its fault case with the runner's sentence, and the correct job
# passing cases 14-18 under retry. The three languages run at once, each
# language's wrappers in a lane of their own: about 3 minutes on the 2-core
# machine (193 s measured, the Celery wrapper's 13 cases 141 s of it; 385 s
# at a load average of 14 with the correct variants on every case; a
# mutation 1-11 s, a fault at the effect 6-33 s, the correct job's 14 cases
# under hold about 30 s). With the Ruby and Node.js wrappers (2026-12-04):
# 209 s in a fresh bookworm root at a load average of 10-15 (the lanes:
# Celery's wrapper 209 s, the plain ones 190-198 s, the Sidekiq wrapper 34
# s, idempotent and idempotentBatch 62 s; the hook 325 s with its installs);
# on the host, just before, 250 s at load 8-12 where main's took 190 s at
# load 4-6: the lanes wait for leases more than they compute, and the
# Celery lane, the longest, is the one load slows most.
# It runs in the background (lane 3, after hook 84), beside the host's
# other hooks, on a throwaway cluster of its own (hook 83 restarts the
# host's).
# Installs python3-psycopg, python3-celery, ruby, ruby-pg and ruby-sidekiq (root) when
# missing; Node.js 22 as hook 80 gets it (examples/e2e/deps.sh), and
# helpers/node's packages (npm ci there, from its lock file, once).
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs python3-psycopg python3-celery ruby ruby-pg ruby-sidekiq
e2e_node examples/sqs 22
e2e_npm helpers/node
# the host's cluster is scripts/test's: forget it here, and make one's own
unset CLUSTER_DIR PGDATA PGHOST PGPORT
source scripts/cluster.sh
cluster_start
test/catalogue/run.sh
