//! The slab of tasks a core owns (registered, not yet complete), so that
//! shutdown can cancel tasks nobody will ever wake again.
//!
//! Invariants: each slot holds one local reference; a task's
//! `owned_slot` equals the index of its slot while registered and
//! `UNREGISTERED` otherwise; owner thread only.

use crate::task::LocalRef as TaskRef;

/// A free-list slab of task references.
#[derive(Default)]
pub(crate) struct OwnedTasks {
    slots: Vec<Option<TaskRef>>,
    free: Vec<usize>,
    len: usize,
}

impl OwnedTasks {
    /// Registers `task` and records its slot in the task.
    ///
    /// # Safety
    /// Owner core's thread; the task is not registered.
    pub(crate) unsafe fn insert(&mut self, task: TaskRef) {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        task.set_owned_slot(index);
        self.slots[index] = Some(task);
        self.len += 1;
    }

    /// Unregisters the task at `index`, returning the slab's reference.
    ///
    /// # Safety
    /// Owner core's thread.
    pub(crate) unsafe fn remove(&mut self, index: usize) -> Option<TaskRef> {
        let task = self.slots.get_mut(index)?.take()?;
        task.set_owned_slot(crate::task::UNREGISTERED);
        self.free.push(index);
        self.len -= 1;
        Some(task)
    }

    /// Unregisters every task.
    ///
    /// # Safety
    /// Owner core's thread.
    pub(crate) unsafe fn drain(&mut self) -> Vec<TaskRef> {
        let tasks: Vec<TaskRef> = self.slots.drain(..).flatten().collect();
        for task in &tasks {
            task.set_owned_slot(crate::task::UNREGISTERED);
        }
        self.free.clear();
        self.len = 0;
        tasks
    }

    /// Number of registered tasks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}
