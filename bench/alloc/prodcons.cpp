// Producer/consumer with cross-thread frees, for `loci bench alloc --programs` (program `cxx`).
//
//   prodcons PRODUCERS CONSUMERS MESSAGES_PER_PRODUCER
//
// Each producer allocates messages (a std::string name, a std::vector<uint64_t> payload of
// 1..4095 words, a std::map of a few entries), fills them from its own deterministic generator
// and pushes them in batches onto one bounded queue. Consumers pop batches, keep each message in
// a ring of 64 for a while (so blocks live across many later allocations), then check and free
// it: every block is freed by a thread other than the one that allocated it. The checksum is a
// sum over messages of a hash of their contents, so it does not depend on which consumer got
// which message: the output is the same under every allocator and schedule.
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Message {
  std::string name;
  std::vector<uint64_t> payload;
  std::map<uint32_t, std::string> tags;
};

using Batch = std::vector<Message*>;

struct Queue {
  std::mutex m;
  std::condition_variable not_empty, not_full;
  std::deque<Batch*> q;
  size_t cap = 32;
  int producers_left = 0;

  void push(Batch* b) {
    std::unique_lock<std::mutex> l(m);
    not_full.wait(l, [&] { return q.size() < cap; });
    q.push_back(b);
    not_empty.notify_one();
  }
  // nullptr once every producer is done and the queue is empty.
  Batch* pop() {
    std::unique_lock<std::mutex> l(m);
    not_empty.wait(l, [&] { return !q.empty() || producers_left == 0; });
    if (q.empty()) return nullptr;
    Batch* b = q.front();
    q.pop_front();
    not_full.notify_one();
    return b;
  }
  void producer_done() {
    std::lock_guard<std::mutex> l(m);
    producers_left--;
    not_empty.notify_all();
  }
};

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

uint64_t digest(const Message& m) {
  uint64_t h = mix(m.name.size());
  for (char c : m.name) h = mix(h ^ static_cast<unsigned char>(c));
  for (uint64_t w : m.payload) h = mix(h ^ w);
  for (const auto& kv : m.tags) h = mix(h ^ kv.first ^ (kv.second.size() << 32));
  return h;
}

void produce(Queue& q, uint64_t id, uint64_t messages) {
  uint64_t s = mix(id + 1);
  Batch* b = new Batch();
  for (uint64_t i = 0; i < messages; i++) {
    s = mix(s + i);
    auto* m = new Message();
    m->name = "producer-" + std::to_string(id) + "-message-" + std::to_string(i);
    // Mostly small payloads (1..16 words), 1 in 8 up to 1,039 words, 1 in 64 up to 4,095 words.
    size_t words = 1 + (s & 0xf);
    if ((s >> 8 & 7) == 0) words = 16 + (s >> 16 & 0x3ff);
    if ((s >> 12 & 63) == 0) words = 1024 + (s >> 20 & 0xbff);
    m->payload.resize(words);
    for (size_t w = 0; w < words; w++) m->payload[w] = s ^ (w * 0x9e3779b97f4a7c15ULL);
    for (uint32_t t = 0; t < (s >> 40 & 3); t++)
      m->tags.emplace(t, std::string(8 + (s >> (44 + t) & 31), 'a' + t));
    b->push_back(m);
    if (b->size() == 64) {
      q.push(b);
      b = new Batch();
    }
  }
  if (!b->empty())
    q.push(b);
  else
    delete b;
  q.producer_done();
}

void consume(Queue& q, uint64_t* sum, uint64_t* count) {
  std::vector<Message*> ring(64, nullptr);
  size_t k = 0;
  uint64_t s = 0, n = 0;
  auto retire = [&](Message* m) {
    s += digest(*m);
    n++;
    delete m;
  };
  while (Batch* b = q.pop()) {
    for (Message* m : *b) {
      if (ring[k]) retire(ring[k]);
      ring[k] = m;
      k = (k + 1) % ring.size();
    }
    delete b;
  }
  for (Message* m : ring)
    if (m) retire(m);
  *sum = s;
  *count = n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s PRODUCERS CONSUMERS MESSAGES_PER_PRODUCER\n", argv[0]);
    return 2;
  }
  int producers = std::atoi(argv[1]), consumers = std::atoi(argv[2]);
  uint64_t messages = std::strtoull(argv[3], nullptr, 10);
  if (producers < 1 || consumers < 1 || messages < 1) {
    std::fprintf(stderr, "PRODUCERS, CONSUMERS and MESSAGES_PER_PRODUCER must be positive\n");
    return 2;
  }
  Queue q;
  q.producers_left = producers;
  std::vector<uint64_t> sums(consumers), counts(consumers);
  std::vector<std::thread> threads;
  for (int c = 0; c < consumers; c++) threads.emplace_back(consume, std::ref(q), &sums[c], &counts[c]);
  for (int p = 0; p < producers; p++) threads.emplace_back(produce, std::ref(q), p, messages);
  for (auto& t : threads) t.join();
  uint64_t sum = 0, count = 0;
  for (int c = 0; c < consumers; c++) {
    sum += sums[c];
    count += counts[c];
  }
  std::printf("messages %llu checksum %016llx\n", static_cast<unsigned long long>(count),
              static_cast<unsigned long long>(sum));
  return count == messages * producers ? 0 : 1;
}
