//! The state of every stream of a model, as rows of one state: a stream owns a row from its
//! start to its end. A step of one stream runs on its row in place; a batched step selects its
//! streams' rows (one `index_select` per state tensor, whatever the number of rows) and puts
//! them back (one `index_copy_` each). A CUDA graph records that selection with the rows as a
//! device tensor of indices, so any cohort of streams replays the same graph.
//!
//! The rows no stream owns are a list of their own (behind its own lock, see [`FreeRows`]): a new
//! stream takes one without waiting for the compute thread, which may be running a batch for
//! hundreds of milliseconds; its first step clears it there. Only growing, releasing and
//! shrinking need the compute thread.
//!
//! Row 0 belongs to no stream: it is the scratch row that pads a batch up to a graph's size and
//! that graphs warm up on. Nobody reads it.
//!
//! The rows grow in place of need (doubling; the old rows copied over), and shrink (halving)
//! when streams have ended and every row in use lies in the lowest quarter: the memory follows
//! the streams open, with room to double before growing again. Rows are handed out lowest
//! first, so the rows of the streams left gather at the bottom. Growing or shrinking moves
//! every row, so graphs recorded before are void (see [`Arena::generation`]).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::model::log;
use crate::model::network::{Network, State};

type TorchResult<T> = Result<T, tch::TchError>;

/// The row that pads batches and warms graphs up.
pub const SCRATCH_ROW: i64 = 0;

/// The rows of a new arena, and the fewest it shrinks to.
const MIN_ROWS: i64 = 4;

/// Rows no stream owns, the lowest last; shared by the arena (on the compute thread, which
/// holds this lock while it grows, releases or shrinks) and whoever hands rows to new streams.
#[derive(Clone, Default)]
pub struct FreeRows(Arc<Mutex<Vec<i64>>>);

impl FreeRows {
    fn lock(&self) -> MutexGuard<'_, Vec<i64>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lowest free row, if there is one: a new stream's, which its first step clears
    /// (whatever an ended stream left in it).
    pub fn take(&self) -> Option<i64> {
        self.lock().pop()
    }
}

#[derive(Default)]
pub struct Arena {
    /// None until the first stream starts.
    state: Option<State>,
    free: FreeRows,
    generation: u64,
}

impl Arena {
    /// The free rows, for taking one without the compute thread.
    pub fn free_rows(&self) -> FreeRows {
        self.free.clone()
    }

    /// A row for a new stream, growing the rows if none is free; its first step clears it. On
    /// the device's compute thread.
    pub fn allocate(&mut self, network: &Network) -> TorchResult<i64> {
        let free = self.free.clone();
        let mut free = free.lock();
        if free.is_empty() {
            self.grow(network, &mut free)?;
        }
        Ok(free.pop().expect("rows after growing"))
    }

    /// Gives `row` back, for a later stream, and shrinks the rows when those in use all lie in
    /// the lowest quarter. On the device's compute thread.
    pub fn release(&mut self, row: i64) -> TorchResult<()> {
        let free = self.free.clone();
        let mut free = free.lock();
        debug_assert!(
            row != SCRATCH_ROW && !free.contains(&row),
            "row {row} released twice"
        );
        free.push(row);
        // Lowest last, so that the streams of a quiet model keep to the first rows.
        free.sort_unstable_by(|a, b| b.cmp(a));
        let mut rows = self.rows();
        while rows > MIN_ROWS && self.highest_in_use(&free) < rows / 4 {
            rows /= 2;
        }
        if rows < self.rows() {
            self.shrink(rows, &mut free)?;
        }
        Ok(())
    }

    /// The highest row a stream owns (the scratch row when none).
    fn highest_in_use(&self, free: &[i64]) -> i64 {
        // `free` is sorted from the highest down: the rows above the first gap in it from the
        // top are free.
        let mut highest = self.rows() - 1;
        for &row in free {
            if row != highest {
                break;
            }
            highest -= 1;
        }
        highest
    }

    fn shrink(&mut self, rows: i64, free: &mut Vec<i64>) -> TorchResult<()> {
        let shrunk = self.state().shrunk(rows)?;
        let before = self.state().bytes();
        self.state = Some(shrunk);
        free.retain(|&row| row < rows);
        self.generation += 1;
        give_back_freed_memory();
        log::debug(format_args!(
            "state arena shrunk to {rows} rows ({} MB, {} MB freed)",
            self.state().bytes() / 1_000_000,
            (before - self.state().bytes()) / 1_000_000
        ));
        Ok(())
    }

    fn grow(&mut self, network: &Network, free: &mut Vec<i64>) -> TorchResult<()> {
        let rows = self.rows();
        let grown_rows = (rows * 2).max(MIN_ROWS);
        let grown = match &self.state {
            Some(state) => state.grown(network, grown_rows)?,
            None => network.new_state(grown_rows)?,
        };
        self.state = Some(grown);
        free.extend((rows.max(SCRATCH_ROW + 1)..grown_rows).rev());
        self.generation += 1;
        log::debug(format_args!(
            "state arena grown to {grown_rows} rows ({} MB)",
            self.state().bytes() / 1_000_000
        ));
        Ok(())
    }

    /// Every row, the scratch row included.
    ///
    /// # Panics
    /// Before the first row is allocated.
    pub fn state(&self) -> &State {
        self.state
            .as_ref()
            .expect("the arena has rows once a stream started")
    }

    pub fn state_mut(&mut self) -> &mut State {
        self.state
            .as_mut()
            .expect("the arena has rows once a stream started")
    }

    pub fn rows(&self) -> i64 {
        self.state.as_ref().map_or(0, State::rows)
    }

    /// Counts the times the rows moved to new memory.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.state
            .as_ref()
            .map_or(0, |state| state.bytes() / state.rows() as usize)
    }
}

/// Hands memory the allocator keeps after frees back to the system: glibc returns the large
/// blocks of the old rows at once, but keeps smaller freed ones (below its mmap threshold,
/// which rises as large blocks are freed) for reuse.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only releases free memory of its own heaps.
        unsafe {
            malloc_trim(0);
        }
    }
}
