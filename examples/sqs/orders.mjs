// orders.mjs: stands in for the application's own orders table: the message
// for an order is built from it, by the publisher and by the sweeper alike,
// so a re-enqueued message has the same body (and fingerprint) as the first.
export function confirmationMessage(order, email = `customer-${order.toLowerCase()}@example.test`) {
  return JSON.stringify({ order, email });
}
