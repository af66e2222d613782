"""Publish one record_payment message for a payment:

    ../.venv/bin/python enqueue.py PAY-1 [--amount CENTS]

The message is payments.payment_args(payment); --amount gives another
amount (other arguments under the same key: the claim refuses it, ID002).
Publisher confirms: exit 0 means the broker has the message.
"""
import argparse

from payments import app, payment_args, record_payment

ap = argparse.ArgumentParser(description="enqueue record_payment for one payment")
ap.add_argument("payment")
ap.add_argument("--amount", type=int, help="another amount in cents (other arguments)")
args = ap.parse_args()
kwargs = payment_args(args.payment)
if args.amount is not None:
    kwargs["amount_cents"] = args.amount
app.conf.broker_transport_options = {"confirm_publish": True}
record_payment.apply_async(kwargs=kwargs)
