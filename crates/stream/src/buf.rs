//! Chunk buffers that live on a chosen node, and per-thread pools that recycle them.
//!
//! A [`NodeBuf`] is a loci-place [`NodeRegion`] placed `preferred` on one node and populated at
//! once, so its pages are there before the hot path uses it (malloc of 11 MB blocks recycles
//! pages across threads and cannot promise a node). A [`Pool`] belongs to one stage thread; a
//! [`PooledBuf`] goes back to its home pool when the next stage drops it, so a buffer is always
//! reused by the thread (and node) that allocated it.

use std::io;
use std::ops::{Deref, DerefMut};

use crossbeam_channel::{Receiver, Sender};
use loci_place::region::{NodeRegion, RegionError};
use loci_place::MemPlan;
use loci_topo::NodeSet;

/// A page-aligned buffer of fixed capacity, with its pages placed on one node when asked.
pub struct NodeBuf {
    map: NodeRegion,
    len: usize,
    node: Option<u32>,
}

impl NodeBuf {
    /// Maps `cap` bytes (at least one page); with `node`, places them there (preferred, so a full
    /// node falls back instead of failing) and faults every page in.
    pub fn new(cap: usize, node: Option<u32>) -> io::Result<Self> {
        Self::with_populate(cap, node, true)
    }

    /// Like [`NodeBuf::new`]; with `populate == false` the pages are left to fault in on first
    /// write (still on `node`: the policy is set first). For buffers sized to a worst case and
    /// usually filled about half, such as LZ4 output (`Codec::bound` of a chunk that compresses
    /// about 2:1), that zeroes half the memory.
    pub fn with_populate(cap: usize, node: Option<u32>, populate: bool) -> io::Result<Self> {
        let plan = node.map_or_else(MemPlan::first_touch, MemPlan::preferred);
        // No huge pages: measured on this project's (virtualised) machine, huge pages came from
        // memory the hypervisor had never backed, and zeroing them cost more than the whole
        // compression of the chunk; 4 KiB pages are recycled warm from the kernel's free lists.
        let mut map = NodeRegion::map(cap, &plan, false).map_err(|e| match e {
            RegionError::Map { source, .. } => source,
            RegionError::Place(e) => io::Error::other(e),
        })?;
        if populate {
            map.populate();
        }
        Ok(NodeBuf { map, len: 0, node })
    }

    /// Capacity in bytes (a multiple of the page size).
    pub fn capacity(&self) -> usize {
        self.map.len()
    }
    /// The node this buffer was bound to, if any.
    pub fn node(&self) -> Option<u32> {
        self.node
    }
    /// Sets the length of the valid prefix. Panics beyond the capacity (a caller bug).
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "NodeBuf length {len} beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }
    /// The whole capacity as a writable slice (for codecs and reads that fill it).
    pub fn spare(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is cap bytes, initialised (zero pages), and exclusively ours.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr(), self.capacity()) }
    }
    /// Nodes that hold this buffer's pages right now (from `move_pages`), sampled at up to 16 pages.
    pub fn actual_nodes(&self) -> io::Result<NodeSet> {
        let shares = self.map.sample_nodes(0, self.capacity(), 16)?;
        Ok(shares.into_iter().map(|(n, _)| n).collect())
    }
}

impl Deref for NodeBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: len <= cap, the prefix is initialised.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.len) }
    }
}
impl DerefMut for NodeBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: len <= cap, exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr(), self.len) }
    }
}

/// Free buffers of one stage thread.
#[derive(Clone)]
pub struct Pool {
    tx: Sender<NodeBuf>,
    rx: Receiver<NodeBuf>,
    cap: usize,
    node: Option<u32>,
    populate: bool,
}

impl Pool {
    /// A pool of buffers of `cap` bytes on `node`, keeping at most `keep` free ones.
    pub fn new(cap: usize, node: Option<u32>, keep: usize) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(keep.max(1));
        Pool {
            tx,
            rx,
            cap,
            node,
            populate: true,
        }
    }
    /// A pool whose new buffers fault their pages in on first write ([`NodeBuf::with_populate`]).
    pub fn lazy(cap: usize, node: Option<u32>, keep: usize) -> Self {
        Pool {
            populate: false,
            ..Self::new(cap, node, keep)
        }
    }
    /// The buffer a thread will use first, with its first page resident (written, for lazy
    /// pools), to record where the thread's buffers live before any chunk arrives: a thread may
    /// get no chunk at all in a short stream. Dropping it returns it to the pool.
    pub fn probe(&self) -> io::Result<PooledBuf> {
        let mut b = self.get()?;
        b.spare()[0] = 0;
        Ok(b)
    }
    /// A free buffer, or a new one when none is free.
    pub fn get(&self) -> io::Result<PooledBuf> {
        let buf = match self.rx.try_recv() {
            Ok(b) => b,
            Err(_) => NodeBuf::with_populate(self.cap, self.node, self.populate)?,
        };
        Ok(PooledBuf {
            buf: Some(buf),
            home: self.tx.clone(),
        })
    }
}

/// A buffer that returns to its home pool when dropped.
pub struct PooledBuf {
    buf: Option<NodeBuf>,
    home: Sender<NodeBuf>,
}

impl Deref for PooledBuf {
    type Target = NodeBuf;
    fn deref(&self) -> &NodeBuf {
        self.buf.as_ref().expect("buffer present until drop")
    }
}
impl DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut NodeBuf {
        self.buf.as_mut().expect("buffer present until drop")
    }
}
impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(mut b) = self.buf.take() {
            b.set_len(0);
            // A full pool (or one whose owner is gone) simply unmaps the buffer.
            let _ = self.home.try_send(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_recycled_to_their_pool_and_sit_on_their_node() {
        let pool = Pool::new(100_000, Some(0), 4);
        let mut a = pool.get().unwrap();
        let cap = a.capacity();
        assert!(cap >= 100_000 && cap.is_multiple_of(loci_place::sys::page_size()));
        a.set_len(10);
        a.copy_from_slice(b"0123456789");
        assert_eq!(&a[..], b"0123456789");
        assert_eq!(a.actual_nodes().unwrap(), NodeSet::single(0));
        let p = a.spare().as_ptr();
        drop(a);
        let b = pool.get().unwrap();
        assert_eq!(b.len(), 0, "recycled buffers come back empty");
        assert_eq!(b.as_ptr_range().start, p, "the freed buffer is reused");
        // Dropped in another thread: still goes home.
        std::thread::spawn(move || drop(b)).join().unwrap();
        assert_eq!(pool.get().unwrap().spare().as_ptr(), p);
    }

    #[test]
    fn lazy_buffers_fault_in_on_their_node_when_written() {
        let pool = Pool::lazy(1 << 20, Some(0), 2);
        let mut b = pool.get().unwrap();
        assert!(
            b.actual_nodes().unwrap().is_empty(),
            "nothing is resident before the first write"
        );
        b.spare()[..300_000].fill(7);
        b.set_len(300_000);
        assert!(b.iter().all(|&x| x == 7));
        assert_eq!(b.actual_nodes().unwrap(), NodeSet::single(0));
        // The untouched rest reads as zeros.
        assert!(b.spare()[300_000..].iter().all(|&x| x == 0));
    }
}
